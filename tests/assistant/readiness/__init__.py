"""Tests of kernel_pytorch.assistant.readiness."""
