"""How the PPO expert was made: CarRacing as the expert sees it (``env``), its SB3 zip
(``expert_zip``), PPO training and its arguments (``training``, ``training_args``), the
DAgger kickstart from the privileged teacher (``kickstart``) and kickstarted PPO
(``kickstarted_ppo``). ``nac-drive expert ...`` runs them; the actor that drives with the
result is :class:`~nac_drive.agents.ppo_expert.PPOExpert`, one room up.
"""
