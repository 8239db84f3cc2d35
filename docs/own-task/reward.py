"""A reward function in TRL's form: completions, plus the data set's columns as keyword arguments."""


def reward(completions, answer, **kwargs):
    return [1.0 if completion.strip() == gold else 0.0 for completion, gold in zip(completions, answer)]
