"""Tests of kernel_pytorch.assistant.compile_time."""
