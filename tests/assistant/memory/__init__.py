"""Tests of kernel_pytorch.assistant.memory."""
