"""Study tooling on top of the loop: `freshper compare` (arms x seeds at one env-step budget),
its report and paired readouts, what replay did in a run (replay_stats.py), and `freshper chance`
(the score of a policy that answers at random)."""
