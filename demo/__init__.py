"""The CPU demo (demo/run.py) and its toy task (demo/toy.py): the whole pipeline on a 2-core CPU in
minutes. A reader of the method needs it only to run the demo."""
