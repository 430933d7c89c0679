import click
@click.group()
def cli():
    pass
def submit_entry():
    pass
