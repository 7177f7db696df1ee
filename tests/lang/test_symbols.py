from asrflow.kaldi import khg
from asrflow.lang.graph import compile_text_fst
from asrflow.lang.symbols import add_disambig, lexicon_fst_text, phone_table, topology_text, word_table


def test_disambiguation_symbols_for_homophones_and_prefixes() -> None:
    entries, top = add_disambig({"red": [["R", "EH", "D"]], "read": [["R", "EH", "D"], ["R", "IY", "D"]],
                                 "re": [["R", "EH"]], "x": [["EH", "K", "S"]]})
    prons = dict(((w, tuple(p)) for w, p in entries if w != "read"))
    assert prons["red"] == ("R", "EH", "D", "#2") and prons["re"] == ("R", "EH", "#1") and top == 2
    assert ("read", ["R", "EH", "D", "#1"]) in entries and ("read", ["R", "IY", "D"]) in entries
    assert prons["x"] == ("EH", "K", "S")


def test_topology_text_is_read_by_kaldi() -> None:
    topo = khg.HmmTopology()
    topo.read(topology_text([3, 4, 5], [1, 2]))
    assert list(topo.phones) == [1, 2, 3, 4, 5]
    assert list(topo.get_phone_to_num_pdf_classes()) == [-1, 5, 5, 3, 3, 3]


def test_lexicon_fst_compiles_with_optional_silence() -> None:
    phones = {p: i for i, p in enumerate(phone_table(["SIL"], ["a", "b"], 1))}
    words = {w: i for i, w in enumerate(word_table(["ab", "<SIL>"]))}
    text = lexicon_fst_text([("ab", ["a", "b"]), ("<SIL>", ["SIL"])], "SIL", 0.5, disambig_loop=True,
                            sil_disambig="#1")
    fst = compile_text_fst(text, phones, words)
    assert fst.num_states == 5 and fst.start == 0  # start, loop, silence, after-silence, inside "ab"
