"""The terminal UI of a live or finished run (`solrl train --tui`, `solrl monitor`)."""
