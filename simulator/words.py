"""The fixed list of common words that text prompts are built from (`simulator.live.prompts`) and the
built-in emulator answers with (`simulator.emulator.server`): shared here so that neither package
imports the other."""

# Common English words that are one token each in the usual BPE vocabularies when preceded by a space.
WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
    """the of and to in is was for on as with by at from his an were are which this be or has had not
    but one their its also first two new after who they have her she been other all there more when into
    time only can year some over most would up he about out later these many so may then years we where
    such while both during three part through no used under between made state being world could work
    city known since people will before area found did each what now any back game back music film team
    season own if them until well against last long school same around war even life however four group
    high most series based house name early end just de several because family local line main played
    water small best way five left right second village own number city side great still power often city
    land old very down day again use north south east west set him three good place around much off come
    called public them large home given both general book order form day town did take few become another
    point thing case fact week month body head hand eye face room door car road night light river field
    paper story word money level open change move turn show play run hold bring keep begin seem help talk
    tell ask need feel try leave call put mean let""".split()
    )
)
