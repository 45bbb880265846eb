"""The process: one worker's serve loop and drain, the supervisor of several, reloads."""
