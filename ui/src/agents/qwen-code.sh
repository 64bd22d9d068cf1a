export OPENAI_BASE_URL={base}/v1
export OPENAI_API_KEY={key}
export OPENAI_MODEL={model}
