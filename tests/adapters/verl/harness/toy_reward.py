"""A dense toy reward for the CPU harness (varies from response to response, so GRPO with one
greedy sample per prompt, whose advantage is the raw score, really updates the model)."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):  # noqa: ANN001, ANN201
    text = solution_str or ""
    if not text:
        return 0.0
    hits = sum(ch in ground_truth for ch in text)
    return hits / len(text) + 0.1 * len(set(text)) / len(text)
