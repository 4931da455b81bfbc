"""Insert, exact lookup, prefix lookup, completion."""

from triex.node import Node


class Trie:
    def __init__(self):
        self.root = Node()

    def insert(self, word):
        node = self.root
        for ch in word:
            node = node.children.setdefault(ch, Node())
        node.terminal = True

    def _walk(self, text):
        node = self.root
        for ch in text:
            node = node.children.get(ch)
            if node is None:
                return None
        return node

    def contains(self, word):
        return self._walk(word) is not None

    def starts_with(self, prefix):
        return self._walk(prefix) is not None

    def complete(self, prefix):
        start = self._walk(prefix)
        out = []
        stack = [(start, prefix)] if start else []
        while stack:
            node, text = stack.pop()
            if node.terminal:
                out.append(text)
            stack.extend((child, text + ch) for ch, child in node.children.items())
        return sorted(out)
