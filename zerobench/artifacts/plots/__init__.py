"""An artifact's table drawn as its figure in the paper's form: the shared drawing (`draw`), the
paper-scale figures (`paper`) and the scaling figures on log-2 axes (`scaling`)."""
