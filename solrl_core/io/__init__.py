"""Files: the run folder, atomic writes, bounded JSON, image grids and PNGs, clips as MP4 or GIF."""
