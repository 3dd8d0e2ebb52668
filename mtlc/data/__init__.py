"""The data: image files, their decoding and decode cache, the datasets and splits, the batches a step trains on, and copies among the images."""
