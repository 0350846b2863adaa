"""Tests of kernel_pytorch.assistant.fusion."""
