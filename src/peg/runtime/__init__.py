"""How an `Ensemble` runs its members (`peg.ensemble` is the public class): the strategies
(`strategies`: loop, vmap, folded, chunked) and the rule by which `"auto"` picks one
(`auto_strategy`), members folded into the batch (`folded`), the shared trunk run once and the
heads (`heads`), and what every predictor derives from its `member_logits` (`predicts`)."""
