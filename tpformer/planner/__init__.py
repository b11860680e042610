"""tpformer-plan's model of a run: memory per rank and step time of any layout on a cluster,
and the search over layouts. The startup plan of `tpformer-pretrain` uses the same model."""
