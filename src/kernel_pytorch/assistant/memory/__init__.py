"""Memory bottlenecks of a training step: `step` (one forward + backward, and an optimizer step, with
every saved tensor accounted), `memory` (the analysis: what holds the peak and what would free it)."""
