"""Power loss: a lost-fsync file system under the engine's store, and the fault that cuts it.

- `journal`: what a cut would take back (pure: writes and directory entries not yet covered
  by an fsync, dropped whole, in a seeded subset, or one write torn);
- `fs`: the FUSE file system over it, a child process of the harness;
- `mount`: starting, controlling and always unmounting it; `unavailable()` names why a
  machine cannot mount one;
- `fault`: the power_loss fault of a run (every engine process killed at once, the store
  read, the unsynced writes dropped, the mount remade, the store read again).
"""
