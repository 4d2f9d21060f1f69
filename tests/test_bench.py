"""grpo bench's FLOP estimate, by hand."""

from grpo.bench import flops_per_step, summarize


def test_flops_per_step_counts_each_pass():
    # 10 parameters, 24 tokens. mu = 1, beta > 0: sampling + reference forwards (2 x 2 x 10 x 24
    # = 960) and one forward+backward (6 x 10 x 24 = 1440).
    assert flops_per_step(10, 24, num_iterations=1, beta=0.04) == 2400
    # mu = 2 adds the pi_old forward and a second forward+backward; beta = 0 drops the reference.
    assert flops_per_step(10, 24, num_iterations=2, beta=0.0) == 2 * 10 * 24 * 2 + 6 * 10 * 24 * 2


def test_summarize_counts_a_groups_prompt_once_and_skips_the_first_step():
    step = {"tokens/completion": 20, "completion/len_mean": 5.0}
    history = [{"step": 1, "time/step_s": 9.0, "tokens/prompt": 16, **step},      # warm-up: not timed
               {"step": 2, "time/step_s": 2.0, "tokens/prompt": 16, **step}]
    out = summarize(history, params=10, num_iterations=1, beta=0.04, group_size=4)
    # 16 prompt tokens over rows = 4 computed (groups of 4); 4 + 20 = 24 tokens -> 2400 FLOPs in 2 s
    assert out["model_flops_per_s"] == 1200
    assert out["sec_per_step"] == 2.0 and out["tokens_per_s"] == 10.0
    assert out["step_times"] == [9.0, 2.0]
