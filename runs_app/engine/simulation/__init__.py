"""The simulated user (coder-eval's `simulation:`): who answers the agent (`answerers`: scripted,
an LLM persona, or a plugin) and the conversation's turns until the stop token or `max_turns`
(`conversation`). The agent's phase drives it; the persona's model calls go through the
answerer's gateway (`gateway.roles`). No Django.
"""
