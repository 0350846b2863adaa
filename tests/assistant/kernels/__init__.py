"""Tests of kernel_pytorch.assistant.kernels."""
