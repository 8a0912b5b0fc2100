"""The pieces every architecture shares: linears in each weight format, rotary tables,
attention over the paged pool, gated activations. Norms are row_ops.py's."""
