"""What a run will do on this machine, decided once: the stage plan, precisions, copies, compile, memory modes and the
memory estimate."""
