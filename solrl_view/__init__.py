"""What a run looks like in a terminal: the plain lines `solrl train` prints (display.py), the end summary,
the words for each event (words.py) and a console that shows a run folder's text safely. Both front doors
print through it: the command line (solrl_cli) and the Python API (solrl), siblings over solrl_core."""
