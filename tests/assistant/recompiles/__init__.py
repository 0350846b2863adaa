"""Tests of kernel_pytorch.assistant.recompiles."""
