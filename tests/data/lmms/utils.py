"""Hooks of the ottvid_tiny lmms-eval task (tests/test_lmms_plugin.py makes the video paths absolute)."""


def doc_to_visual(doc):
    return [doc["video"]]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return "\n".join([doc["question"], *doc["options"], "Answer with the option's letter from the given choices directly."])


def process_results(doc, results):
    reply = results[0].strip()
    return {"accuracy": float(reply[:1].upper() == doc["answer"])}
