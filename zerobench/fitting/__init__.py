"""Fitting the performance model's constants (perfmodel/constants.py) to the paper's points
(`fit`), and checking the fitted model on points it was not fitted on: published runs on other
hardware (`external`) and the paper's own batch sizes (`batch_check`)."""
