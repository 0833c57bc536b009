"""The machine a stage runs on: CPUs, threads, OpenMP, VRAM and the row budget measured at start."""
