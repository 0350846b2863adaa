"""Tests of kernel_pytorch.assistant.report."""
