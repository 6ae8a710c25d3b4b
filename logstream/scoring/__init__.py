"""Scoring: from the model's token surprisal to a calibrated score and an alert decision.

A short pipeline of named stages (`scorer.Scorer` runs them per line):
- `evidence`: the line's surprisal (its most surprising words);
- `levels`: its level, from a level field or failure words, a prior the baseline cannot teach away;
- `calibration` (with `tail`): surprisal -> -log10 p under the tail of held-out baseline lines,
  plus the level's prior; alert severity;
- `rules`: operators' verdicts.
`config.ScoringConfig` holds the few constants, saved with the model.
"""
