"""What a run is fed: prompt sets and files, and the tiny worlds (their grammar and paint)."""
