"""The learning agent: the training config and its field specs, environments, the actor-critic,
the A2C and PPO trainer (M ≥ 1 members), its losses, its optimizer, and replaying a checkpoint
(recordings, re-valued critics)."""
