"""What a long run does when something goes wrong, kept out of the loop itself.

manifest.py  checksums of a checkpoint's files, written last and verified on resume
lock.py      one writer per run folder (an advisory lock that dies with its process)
oom.py       out-of-memory back-off: halve the failing phase's batch and redo the iteration
disk.py      a full or read-only filesystem, whatever raised it, as one clear error
guard.py     non-finite rewards (samples dropped, groups skipped) and non-finite steps (skipped)
"""
