"""Draft trees: several of the draft's candidates at every depth, verified in one target pass.

A round's tree grows below its root, the last verified token, one depth per draft pass. Every frontier node gets its
`width` most probable next tokens as children; the `width` children whose paths are most probable (the product of the
draft's probabilities along them) are the next frontier, fed to the draft together under a tree mask. The `nodes` most
probable candidates go to the target, which verifies them in one pass where each node sees the committed prefix and
its own ancestors. A node is accepted when its token is the target's choice after its parent; the round keeps the
longest accepted path and the target's token after it (EAGLE-2's dynamic draft tree; SpecInfer and Medusa verify trees
the same way). Width 1 is the chain: one candidate per depth, all of them verified.

Everything here runs over device tensors of fixed shapes, so that a captured round replays it.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

from specasr.draft import Draft, DraftCache, DraftOutput
from specasr.targets.base import TreeRows


@dataclass
class Candidates:
    """What a round drafted, every parent before its children, on the device."""

    tokens: Tensor  # (C,) target token ids
    parents: Tensor  # (C,) index of the parent among the candidates; -1 below the root
    depths: Tensor  # (C,) 1..K
    probabilities: Tensor  # (C,) the draft's probability of the token, below its parent
    scores: Tensor  # (C,) float32 log-probability of the path from the root
    sources: Tensor  # (C,) the row of `attention` whose step predicted the token
    attention: Tensor | None = None  # (1 + fed nodes, frames) audio attention of the root's step, then of each fed
    drafted: int = 1  # draft passes that grew it: the root's, then one per further depth


@dataclass
class _Levels:
    """A tree's candidates as it grows, one level (depth) at a time."""

    tokens: list[Tensor] = field(default_factory=list)
    parents: list[Tensor] = field(default_factory=list)
    depths: list[Tensor] = field(default_factory=list)
    probabilities: list[Tensor] = field(default_factory=list)
    scores: list[Tensor] = field(default_factory=list)
    sources: list[Tensor] = field(default_factory=list)

    def add(self, **level: Tensor) -> None:
        for name, values in level.items():
            getattr(self, name).append(values)

    def candidates(self, attention: list[Tensor]) -> Candidates:
        levels = {f.name: torch.cat(getattr(self, f.name)) for f in fields(self)}
        return Candidates(**levels, attention=torch.cat(attention) if attention else None, drafted=len(self.tokens))


def top(draft: Draft, hidden: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """The draft's `width` most probable next tokens (target ids) after each row of output states, and their
    probabilities."""
    probabilities, choices = draft.logits(hidden).softmax(dim=-1).topk(width, dim=-1)
    return probabilities, draft.vocab_to_target(choices)


def grow(
    draft: Draft,
    root: DraftOutput,
    cache: DraftCache,
    base: int | Tensor,
    centres: Tensor,
    window: Callable[[Tensor], Tensor | None],
    width: int,
    depths: int,
    stop_below: float | None = None,
) -> Candidates:
    """The tree below the root, `depths` deep.

    root: the draft's output at its last catch-up row, the one that read the last verified token (one row).
    base: the draft cache's first slot past the catch-up, where the tree's rows go: cache.length, which the feeds
    advance, or with a static cache a device tensor, the feeds then naming their slots.
    centres: (K,) each depth's window centre; `window` turns centres (rows,) into the draft's audio mask.
    stop_below: a chain that reads its proposals' probabilities for free stops after the first one below this.
    """
    level = torch.arange(width, device=root.hidden.device)
    probabilities, tokens = (found[0] for found in top(draft, root.hidden[0], width))
    scores = probabilities.float().log()
    levels = _Levels()
    below_root = level.new_full((width,), -1)
    levels.add(tokens=tokens, parents=below_root, depths=level * 0 + 1, probabilities=probabilities, scores=scores)
    levels.add(sources=level * 0)
    attention = [] if root.attention is None else [root.attention[0]]
    frontier, count = level, width  # the frontier's candidate indices; candidates so far
    states, parent_rows = root.state.expand(1, width, -1), None
    span = (depths - 1) * width
    sees = torch.zeros(0, span, dtype=torch.bool, device=level.device)  # which fed rows each fed row sees
    chain = width == 1 and not cache.static  # each row at the cache's next slot, seeing all before it: no tree
    tree = None
    for depth in range(2, depths + 1):
        if stop_below is not None and probabilities.item() < stop_below:
            break
        rows = (depth - 2) * width + level  # the frontier's rows among the fed ones
        if not chain:
            seen = rows[:, None] == torch.arange(span, device=rows.device)
            if parent_rows is not None:
                seen |= sees.index_select(0, parent_rows)
            sees = torch.cat([sees, seen])
            tree = TreeRows(positions=(base + depth - 2) + level * 0, base=base, sees=seen)
        mask = window(centres[depth - 1 : depth].expand(width))
        out = draft(states, tokens[None], cache, mask, base + rows if cache.static else None, tree, carried=True)
        probabilities, children = top(draft, out.hidden[0], width)
        paths = (scores[:, None] + probabilities.float().log()).flatten()
        parents, sources = (each[:, None].expand(width, width).flatten() for each in (frontier, 1 + rows))
        levels.add(tokens=children.flatten(), parents=parents, depths=parents * 0 + depth, scores=paths)
        levels.add(probabilities=probabilities.flatten(), sources=sources)
        best = paths.topk(width).indices if width > 1 else level
        frontier, tokens, scores = count + best, children.flatten()[best], paths[best]
        states, parent_rows = out.state[:, best // width], rows[best // width]
        count += width * width
        if out.attention is not None:
            attention.append(out.attention[0])
    return levels.candidates(attention)


def choose(candidates: Candidates, nodes: int) -> Tensor:
    """The `nodes` candidates with the most probable paths, in the order drafted. A child's path is never more
    probable than its parent's, and the stable sort keeps a parent ahead of a child as probable, so every chosen
    node's parent is chosen."""
    count = candidates.tokens.shape[0]
    if nodes >= count:
        return torch.arange(count, device=candidates.tokens.device)
    return candidates.scores.sort(descending=True, stable=True).indices[:nodes].sort().values


@dataclass
class Block:
    """A verification block: row 0 is the root (the last verified token), then the chosen nodes."""

    tokens: Tensor  # (N,) the nodes' tokens
    probabilities: Tensor  # (N,) the draft's, of each node's token below its parent
    parents: Tensor  # (N + 1,) each row's parent row; the root counts as its own
    depths: Tensor  # (N + 1,) 0 for the root
    sees: Tensor  # (N + 1, N + 1) row i sees row j: j is i or one of its ancestors

    def rows(self, position: int | Tensor) -> TreeRows:
        """The block as the target's pass places it: the root at `position`, a node `depth` past it."""
        return TreeRows(positions=position + self.depths, base=position, sees=self.sees)


def block(candidates: Candidates, chosen: Tensor, depth: int) -> Block:
    """The chosen candidates as a verification block; `depth`: the deepest a node can be (K)."""
    n = chosen.shape[0]
    rows = torch.arange(n + 1, device=chosen.device)
    row_of = torch.zeros_like(candidates.parents).index_copy(0, chosen, rows[1:])
    parents = candidates.parents.index_select(0, chosen)
    parent_rows = torch.cat([rows[:1], torch.where(parents < 0, 0, row_of[parents.clamp(min=0)])])
    sees, above = rows[:, None] == rows, rows
    for _ in range(depth):
        above = parent_rows[above]
        sees |= rows == above[:, None]
    depths = torch.cat([rows[:1], candidates.depths.index_select(0, chosen)])
    tokens, probabilities = candidates.tokens.index_select(0, chosen), candidates.probabilities.index_select(0, chosen)
    return Block(tokens, probabilities, parent_rows, depths, sees)


def accept(block: Block, choices: Tensor, eot: int, limit: int | Tensor, depth: int) -> tuple[Tensor, Tensor]:
    """The longest path the target agrees with: each of its nodes holds the target's choice after its parent (row by
    row, `choices`), lies no deeper than `limit` and below no end-of-text. Returns the accepted count and the path's
    rows (depth + 1,): the root, then one node per accepted depth, the root again past them. (One-element tensors,
    never indexed by a tensor: that would read the device.)"""
    tokens = torch.cat([block.tokens.new_full((1,), -1), block.tokens])  # the root's token is already verified
    agree = (tokens == choices[block.parents]) & (block.depths <= limit) & (tokens[block.parents] != eot)
    agree |= block.depths == 0
    accepted_rows = ~(block.sees & ~agree).any(dim=1)  # every node on the way agrees
    deepest = (block.depths * accepted_rows).argmax().view(1)
    by_depth = torch.arange(depth + 1, device=choices.device)[:, None] == block.depths
    path = (block.sees.index_select(0, deepest) & by_depth).long().argmax(dim=1)
    return block.depths.index_select(0, deepest), path
