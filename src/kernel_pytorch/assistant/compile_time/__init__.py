"""Compile time: where a cold torch.compile spends its seconds (`compile_time`), and regional
compilation of repeated blocks where it pays (`regional`)."""
