"""The estimator lab: bias², variance and MSE of δ, Â^(k) and GAE(λ) measured against
Monte-Carlo truth, and the exact tabular chain that anchors it."""
