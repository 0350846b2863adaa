"""`optimize(model)`: module swaps and graph rewrites that apply the components and the analyser's
verified fixes to a model, validated against the original.

This layer sits above the components (`nn`, `functional`), the analyser and validation, and below the
CLI (docs/architecture.md). It walks `model.named_modules()` and replaces matching instances; it never
assigns to a third-party class or module attribute (STYLE rule 5).
"""

__all__: list[str] = []
