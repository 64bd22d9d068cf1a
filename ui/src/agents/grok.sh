export GROK_BASE_URL={base}/v1
export GROK_API_KEY={key}
export GROK_MODEL={model}
