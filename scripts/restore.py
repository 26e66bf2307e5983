"""Rule restore: every host back to its original files, servers and agents stopped."""
from thermab import snake
from thermab.restore import restore_all

with snake.logged(snakemake.log[0]):
    problems = restore_all("results", snake.say)
    if problems:
        raise SystemExit(f"restore finished with {len(problems)} problem(s), see above")
