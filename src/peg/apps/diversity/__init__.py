"""`peg diversity`: the loss-landscape analyses of Fort et al. (2019) with PEG placed on them
(the library functions it uses are in `peg.analysis`)."""
