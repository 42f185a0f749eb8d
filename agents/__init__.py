"""Who produces actions: experts (PPO, privileged teacher) and the closed-loop driver."""
