"""The learning agent: the training config and its field specs, environments, the actor-critic,
the A2C+GAE trainer, its optimizer, and replaying a checkpoint (recordings, re-valued critics)."""
