"""gatedloop.cli: the `gatedloop` command line (main.py), what each command opens (app.py), the reviewer prompt
(review.py) and the offline demo command (demo.py)."""
