"""The disk: files the tools keep, opened without following links; outputs that never replace what they should not; runs, work folders and the scripts' streams."""
