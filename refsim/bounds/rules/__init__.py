"""One bound rule per primitive, by family (each module registers its rules on import)."""
