"""The design article's workflow engine as published, with its adapter to the harness contract
(`examples.article_engine.adapter:ARTICLE`); see README.md beside this file."""
