"""Gates run outside the test suite: the CI smoke benchmark against its committed baseline
(`smoke`) and the one-shot check of a lent GPU (`gpu_check`)."""
