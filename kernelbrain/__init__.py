"""KernelBrain: an event-sourced search for fast, correct Triton kernels."""

__version__ = "0.1.0"
