"""`fastscore serve`: prompt log-probs and candidate scores over HTTP, concurrent requests sharing one prefix trie.

batching.py collects the requests that arrive within a few milliseconds and scores them in one backend call;
openai_api.py speaks OpenAI's /v1/completions (echo + logprobs + max_tokens=0: the prompt's log-probs);
score_api.py takes fastscore's own request objects (/v1/score); server.py is the stdlib HTTP server with its limits.
"""
