"""Planning (the login node, no torch): the catalog and its model families, the methods, the grid of cells and
why a cell is invalid, the FLOPs and memory formulas, the SLURM site file, and the Snakefile's parse-time
pipeline with each cell's job spec."""
