"""What a long run does when something goes wrong, kept out of the loop itself.

manifest.py  checksums of a checkpoint's files, written last and verified on resume
lock.py      one writer per run folder (an advisory lock that dies with its process)
links.py     nothing in a run folder is followed out of it: links and special files are refused
phase.py     which phase an out-of-memory error belongs to (the back-off that halves its batch is the
             loop's own policy: solrl_core/loop/backoff.py)
disk.py      a full or read-only filesystem, whatever raised it, as one clear error
guard.py     non-finite rewards (samples dropped, groups skipped) and non-finite steps (skipped)
"""
