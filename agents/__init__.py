"""Who produces actions (the actors of :mod:`nac_drive.policy.actor`).

* :mod:`.ppo_expert`: the PPO expert, an SB3 zip acting on the raw env;
* :mod:`.teacher`: the privileged pure-pursuit teacher (it reads the track, not the pixels);
  :mod:`.planner`: the minimum-time planner, the teacher with a speed profile;
* :mod:`.random_actor`: random actions; :mod:`.experts`: a CarRacing expert by name;
* :mod:`.driver`: the closed-loop driver of a trained policy;
* :mod:`.udacity_scripted`: hand-written Udacity drivers;
* :mod:`.ppo_lab`: how the PPO expert was made (its env, zip I/O, training, kickstart).
"""
