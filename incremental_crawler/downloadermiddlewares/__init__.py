"""Old import paths, kept for settings and errbacks written for them."""
