"""The target model as eaglebox sees it: its config, its layer-id conventions, its embedding and lm_head."""
